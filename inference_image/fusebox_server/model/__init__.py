"""The model layer: the model and the thread that runs it.

Loading, quantizing, decoding, tokenizing, the variants and their load order,
device memory readings, the faults and leaks that live in it, and the tiny model
generator with its corpus (`corpus/`). Imports only the shared modules (`config`,
`errors`); names no OpenAI request field.
"""

"""The transport layer: the HTTP surface and the process around it.

Routes, the OpenAI and admin bodies, the edge middleware, how bodies and errors
are rendered, logging set-up and `server.main`. The only layer that names
starlette or uvicorn; it may import every layer below (control, model, shared).
"""

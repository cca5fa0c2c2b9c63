"""The control layer: decisions about requests and the process's health.

Admission, the breaker, the memory guard, the action ladder, outcome accounting,
quality, stats, the live files, the token limits, the start-up checks, and
`Runtime`, which holds them together. Imports the model layer and the shared
modules (`config`, `errors`), never the transport.
"""

"""The model zoo: a generated checkpoint per model family users deploy.

See docs/decisions/model-zoo.md.

A tool beside the server, not part of it: it may import `fusebox_server.model`,
and nothing in the server imports it.
"""

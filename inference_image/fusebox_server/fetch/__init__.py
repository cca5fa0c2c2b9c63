"""The model fetcher: an init container that brings an s3:// or hf:// model into the pod.

Why a separate step: the server loads from a local directory with
`local_files_only` and no network (DESIGN §3), and a download that fails must
name its reason and stop, not turn into a crash loop of the server. The
fetcher runs before the server (same image), downloads into a cache volume,
verifies every byte against what the source says, and reports progress and the
outcome (fusebox_contract.model_fetch) where the operator reads it.

Layout: `store` (the cache directory: lock, resume, the completeness record),
`progress` (the report), `s3` and `hub` (one per source), `__main__` (the
command). Nothing here imports torch.
"""

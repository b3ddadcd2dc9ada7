"""Serving: a FastAPI app with dynamic batching and an attention explorer page.

``pip install .[serve]`` adds its dependencies (FastAPI, uvicorn); ``python serve.py
checkpoint=PATH`` (seq2seq/cli/serve.py) runs it. Import :func:`create_app` from
:mod:`seq2seq.serving.app`.
"""

"""The OpenAI-compatible HTTP server (FastAPI + uvicorn): `api_server` builds the app; see README "Layout"."""

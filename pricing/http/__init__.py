"""The tenant invoice API (contract 7): a FastAPI app (app.py) of bearer-token access (auth.py,
access.py), invoice and usage routes, and their documents and one-reason errors."""

"""The server: FastAPI routes, the /ws and Realtime sockets, the OpenAI-compatible HTTP APIs, the browser client."""

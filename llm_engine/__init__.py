"""Parley LLM engine: our own Llama-family inference in PyTorch (no asyncio, no web, no audio)."""

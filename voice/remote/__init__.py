"""Stages behind OpenAI-compatible HTTP servers, in the shapes voice/ already uses: LlmBridge, Transcriber, Tts."""

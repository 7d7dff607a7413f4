"""Parley's loaded stages served over the OpenAI-compatible HTTP APIs: chat completions, transcriptions, speech."""

"""Parley voice stages: audio framing, VAD, streaming ASR, phrase chunking, TTS, and the conversation loop."""

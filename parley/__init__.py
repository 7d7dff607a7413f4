"""The application: its config (and the shipped configs/), the model locator, stage loading and the `parley` command.

It wires voice/ (the conversation), llm_engine/ (the engine) and web/ (the server) together; they know nothing of it
except the config and the loaded stages."""

"""The application core: its config (read from the shipped configs/), the model locator, stage loading, the thread
budget and the terminal chat.

It loads voice/ (the conversation) and llm_engine/ (the engine); web/ takes the config and the loaded stages from it,
and the `parley` command (cli/) wires them all. It imports neither of those."""

"""The `parley` command, the top floor: reads the command line and the config, then wires the layers below it —
web/ (serve, stages), desktop/ (client), parley/ (models, chat). Nothing below imports it."""

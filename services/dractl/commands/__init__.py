"""dractl's commands, one module each; `services.dractl.registry` lists them."""

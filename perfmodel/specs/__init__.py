"""Descriptions as data: hardware, models, constants, software stacks, strategies and the knob
registry, with the loaders that check them at the boundary. Nothing here is step physics."""

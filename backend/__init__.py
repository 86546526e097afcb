"""EagleChat backend: the engine, services and the public API the UI and CLI use."""

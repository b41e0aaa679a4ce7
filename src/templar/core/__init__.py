"""Pure core: configuration, model, data pages, schedule, time and durable files. No network I/O."""

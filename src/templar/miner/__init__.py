"""The miner role: train on assigned pages, compress, post, aggregate (see `templar.miner.loop`)."""

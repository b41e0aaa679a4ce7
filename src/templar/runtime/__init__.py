"""The node runtime shared by both roles: start-up, clock, join and catch-up, the outer step, own state and records."""

"""Real example pairs made from pinned registry packages (no model hub needed)."""

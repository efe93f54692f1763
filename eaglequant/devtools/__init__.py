"""Developer tools that build test inputs: the toy pair and synthetic drafts (torch allowed)."""

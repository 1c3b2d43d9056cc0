"""The client integrations, against the real packages (docs/integrations.md)."""

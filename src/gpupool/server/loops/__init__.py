"""Background loops of the server: scheduling (admission and launch) and reconciliation."""

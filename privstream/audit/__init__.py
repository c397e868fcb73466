"""The independent audit: checks what a flow published from its public outputs only."""

"""pytest plugin (registered through the ``pytest11`` entry point): the ``format_audit`` fixture."""

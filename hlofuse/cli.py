"""The ``hlofuse`` command line (placeholder entry; subcommands live below)."""
def run_main():
    raise SystemExit("hlofuse CLI: not yet available")

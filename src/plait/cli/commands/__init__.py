"""The ``plait`` commands, one module each; `plait.cli.app`'s group imports one when named.

What several commands share lives beside this package: `plait.cli.options` (options and
their types), `plait.cli.checks` (what is found wrong before any call), `plait.cli.exits`
(one-line failures and exit codes), `plait.cli.loading` (the program named, its rows),
`plait.cli.file_run` (``run`` and ``eval``'s run over a file).
"""

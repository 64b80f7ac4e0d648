"""User entry points: the `dlrt` command line (and, later, the server)."""

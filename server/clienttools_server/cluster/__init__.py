"""Several server processes on one PostgreSQL ledger: the bus, routing and relays.

``bus`` carries ids between processes (LISTEN/NOTIFY), with what fits of the
rows they name, and ``handlers`` says what this process does for each;
``routing`` picks the connection a browser call goes to, on any process;
``relay`` carries invokes and results for runs of other processes;
``shared_streams`` streams a response from the process that owns its run to
every other one.
"""

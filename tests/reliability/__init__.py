"""Reliability and security scenarios: faults, races, restarts, fuzzing, abuse.

Every scenario records what it tried and what held into `results.RESULTS`; at the
end of the pytest session the collector writes build/reliability.json, and
`python -m tests.reliability.report` turns it into docs/reliability.md.
"""

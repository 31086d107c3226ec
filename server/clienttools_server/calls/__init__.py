"""Browser tool calls between a run and a page: delivery, results, approvals, outside answers.

``proxy`` holds the pending calls of this process and delivers them to pages,
their states a table in ``delivery``; ``results`` is the one path every result
takes; ``settlement`` is the one place a step is settled from outside the
page; ``approvals`` holds the runs that wait for a human; ``pages`` knows the
sessions' connections and the tools they registered; ``pending`` lists and
answers pending calls for the HTTP routes; ``output_schemas`` checks results
(S5); ``remembered`` keeps the tools a session's pages registered.
"""

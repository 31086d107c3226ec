"""Browser tool calls between a run and a page: delivery, approvals, outside answers.

``proxy`` holds the pending calls of this process and delivers them to pages;
``settlement`` is the one place a step is settled from outside the page;
``approvals`` holds the runs that wait for a human; ``pending`` lists and answers
pending calls for the HTTP routes; ``output_schemas`` checks results (S5);
``remembered`` keeps the tools a session's pages registered.
"""

"""The pydantic-ai side: runs, their durable journal, toolsets and streamed chunks.

``launcher`` starts, resumes and stops the runs of this process; ``runs``
drives one agent run per chat request; ``journal`` records every
non-deterministic step in the ledger so a run replays; ``page_tools`` and
``server_tools`` are the run's toolsets; ``chunks`` turns run events into the AI
SDK's chunks and ``chunk_log`` keeps them for subscribers and ``resume``;
``history`` and ``conversations`` are the UIMessages a chat is made of.
"""

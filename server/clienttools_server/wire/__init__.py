"""What faces the network: the page's WebSocket, admission, and the HTTP routes.

``connection`` runs one page's socket (frames in, frames out, limits);
``http_chat`` is the AI SDK's HTTP chat transport on the same runs;
``pending_routes`` and ``chat_routes`` are the JSON routes of pending calls and
stored chats; ``auth`` says who is asking and what they may see.
"""

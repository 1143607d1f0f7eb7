"""Stored chats: the database (store), the service the page and the APIs call (service), what
they see of a chat and its messages (messages: the store's rows stay here), the model's window
over a long chat (window), stateless conversations (conversation), export and import
(transfer), titles, and the JSON text checks (jsontext)."""

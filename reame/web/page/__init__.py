"""The chat page (Gradio): its layout, showing a chat, sending a message and following its
reply, the chat list, the Settings and Users tabs, and its own scripts and styles (page.js,
page_edges.js, page.css, users.css). It imports reame.web.http, never /v1 or the named API."""

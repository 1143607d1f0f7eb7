"""The OpenAI-compatible API under /v1: one module per endpoint, the request models, the
parameter table and the errors they share. It imports reame.web.http, never the page or the
named API."""

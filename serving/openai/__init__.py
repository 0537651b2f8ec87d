"""The OpenAI-compatible routes: request bodies, response shapes, tool calls, beam search,
the Responses API, tokenize."""

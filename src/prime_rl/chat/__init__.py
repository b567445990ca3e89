"""Chats as tokens: chat-template rendering to token ids, and tool calls in the model's text."""

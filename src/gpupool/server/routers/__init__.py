"""Thin HTTP routers: parse, call one service function, return its schema."""

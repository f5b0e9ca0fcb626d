"""The Textual app: a person bargains as a buyer or as the seller; traces replayed step by step."""

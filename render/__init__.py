"""render: GPU-less OpenAI -> token-in rendering (tokenizer, chat template, sampling params)."""

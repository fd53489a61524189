"""The operations behind the commands, siblings over one session (ckpt_tool.session): none imports another."""

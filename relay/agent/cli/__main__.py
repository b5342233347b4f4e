"""``python -m relay.agent.cli``: the relay-agent console script."""

from relay.agent.cli.entry import main

if __name__ == "__main__":
    main()

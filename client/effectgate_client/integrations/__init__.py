"""Ways in for agents that do not hand-write a runner: the MCP gateway
(``mcp_gateway``, the ``effectgate-mcp`` command), and guards for OpenAI Agents SDK
tools (``openai_agents``) and LangChain / LangGraph tools (``langgraph``). Each needs
its extra: ``effectgate-client[mcp]``, ``[openai-agents]``, ``[langgraph]``."""

"""The agent: a language model that drafts contracts and proposes candidates, diffs and priors (docs/agent.md).

Optional: a study without ``budget.llm_tokens`` or without a configured endpoint never touches it.

- ``client``: an OpenAI-compatible chat-completions client (standard library only), its endpoint resolved
  from the contract's ``agent`` section or the environment, a token/cost budget, secret redaction;
- ``answers``: parsing a model's answer and passing each part through the gates every other proposal passes
  (the contract, the library's patch checks on the golden baseline, the space's features) — refusing by name;
- ``prompts``: what the model is shown (the contract, editable files as quoted data, the trial log, the
  posterior) and the answer format it is asked for.

Nothing here publishes: the proposer (and ``init --ask``) records every exchange as ``AgentAsked`` /
``AgentAnswered``, and replay reads the answers from there.
"""

#!/usr/bin/env python3
"""Writes the JSON Schemas of RoleMRC's structured answers (ours: the paper's prompts ask
for text) from one description, so the portable and the local forms say the same:

- profile.schema.json, dialogue.schema.json, stylized.schema.json: the portable forms, for
  any provider (OpenAI strict mode gets them without the keywords it lacks; every answer
  is validated against the whole schema after parsing, on every provider);
- rewrite(.local).schema.json: the ruled rewrite, whose answer may need brackets or
  another language (a nested formatting rule), so only its length is bounded;
- dialogue.{role,user}.local.schema.json: the local dialogue with its first speaker in the
  grammar (a stage's `schemas` by the plan's `first` column);
- *.local.schema.json: for grammar-constrained decoders (the `local` provider, llama.cpp's
  server, vLLM): tighter length bounds (a 135M model writes to the bound it is given),
  dialogue turns that alternate in the grammar (prefixItems).

What a usable value is (issue "every record vouched for"): every text holds two letters
and no square or curly bracket (`WORDS`: `"]["`, `"{{"`, `"['{']"` and `[{'name': ...`
cannot be written), within length bounds; a narration may be empty in the portable
forms (no narration) but holds no bracket.

    python3 pipelines/prompts/rolemrc/schemas.py   # rewrites the ten files
"""

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
# Two letters somewhere, no square or curly bracket anywhere.
WORDS = r"^[^\[\]{}]*[A-Za-z][^\[\]{}]*[A-Za-z][^\[\]{}]*$"
NO_BRACKETS = r"^[^\[\]{}]*$"


def text(lo, hi, description=None, pattern=WORDS):
    s = {"type": "string", "minLength": lo, "maxLength": hi, "pattern": pattern}
    if description:
        s["description"] = description
    return s


def obj(properties, description=None):
    s = {"type": "object"}
    if description:
        s["description"] = description
    s["properties"] = properties
    s["required"] = list(properties)
    s["additionalProperties"] = False
    return s


def array(items, lo, hi, description=None):
    s = {"type": "array", "minItems": lo, "maxItems": hi}
    if description:
        s["description"] = description
    s["items"] = items
    return s


def profile(local):
    # (min, max) characters: portable / local.
    b = (lambda p, l: l) if local else (lambda p, l: p)
    named = lambda: obj({  # noqa: E731
        "name": text(*b((2, 100), (3, 48))),
        "description": text(*b((10, 1000), (15, 160))),
    })
    narration = (
        text(8, 120, "the narration of the role's actions, emotions or scene, without parentheses")
        if local
        else text(0, 500, "the narration of the role's actions, emotions or scene, without parentheses", NO_BRACKETS)
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "RoleMRC standardized role profile (Appendix D, the seven sections of Figure 13)"
        + (" for grammar-constrained decoders (the local provider): tighter length bounds; profile.schema.json is the portable form" if local else "")
        + ". Every text holds words, never bracket debris (written by schemas.py)",
        "type": "object",
        "properties": {
            "role_name": text(*b((2, 100), (3, 60)), "Role Name and Brief Description, first line: the role's own name and title (not the example's), e.g. \"Thorin Ironfoot, the Creative Dwarf\""),
            "brief_description": text(*b((20, 2000), (30, 200)), "Role Name and Brief Description, the description after the name line"),
            "specific_abilities_and_skills": array(named(), 1, 6, "Specific Abilities and Skills"),
            "speech_style": text(*b((20, 1500), (20, 160)), "Speech Style"),
            "personality_characteristics": array(named(), 1, 6, "Personality Characteristics"),
            "past_experience_and_background": array(text(*b((20, 1500), (20, 160))), 1, 5, "Past Experience and Background"),
            "ability_and_knowledge_boundaries": text(*b((20, 1500), (20, 160)), "Ability and Knowledge Boundaries"),
            "speech_examples": array(
                obj({
                    "topic": text(*b((2, 100), (3, 48))),
                    "narration": narration,
                    "speech": text(*b((5, 1500), (15, 160))),
                }),
                1,
                5,
                "Speech Examples: theme keywords, the narration of the role's actions, emotions or scene, and the speech",
            ),
        },
        "required": [
            "role_name",
            "brief_description",
            "specific_abilities_and_skills",
            "speech_style",
            "personality_characteristics",
            "past_experience_and_background",
            "ability_and_knowledge_boundaries",
            "speech_examples",
        ],
        "additionalProperties": False,
    }


def turn(speaker, local):
    content = text(40, 200) if local else text(2, 2000)
    who = {"type": "string", "enum": speaker}
    if not local:
        who["description"] = "\"user\" for the user's turn, \"role\" for the role's turn"
    return obj({"speaker": who, "content": content})


def dialogue_first(first):
    # The local dialogue with its first speaker in the grammar (`schemas` by the plan's
    # `first` column: a role-first variant cannot be written user-first).
    second = "user" if first == "role" else "role"
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"RoleMRC dialogue (Figure 14) for grammar-constrained decoders: as dialogue.local.schema.json, "
        f"with the {first} speaking first in the grammar (written by schemas.py)",
        "type": "object",
        "properties": {"turns": {
            "type": "array",
            "minItems": 10,
            "maxItems": 15,
            "prefixItems": [turn([first if k % 2 == 0 else second], True) for k in range(15)],
            "items": False,
        }},
        "required": ["turns"],
        "additionalProperties": False,
    }


def dialogue(local):
    head = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
    }
    if not local:
        head["title"] = "RoleMRC dialogue (Figure 14): 10 to 15 turns alternating between the user and the role; every turn holds words (written by schemas.py)"
        head["type"] = "object"
        head["properties"] = {"turns": array(turn(["user", "role"], False), 10, 15)}
    else:
        head["title"] = (
            "RoleMRC dialogue (Figure 14) for grammar-constrained decoders (the local provider): 10 to 15 turns "
            "of 40 characters or more that alternate between the user and the role, in the grammar. Not for OpenAI "
            "strict mode (prefixItems); dialogue.schema.json is the portable form (written by schemas.py)"
        )
        head["type"] = "object"
        alternations = []
        for first, second in (("user", "role"), ("role", "user")):
            alternations.append({
                "type": "array",
                "minItems": 10,
                "maxItems": 15,
                "prefixItems": [turn([first if k % 2 == 0 else second], True) for k in range(15)],
                "items": False,
            })
        head["properties"] = {"turns": {"anyOf": alternations}}
    head["required"] = ["turns"]
    head["additionalProperties"] = False
    return head


def stylized(local):
    narration = text(
        0, 200 if local else 500,
        "the narration of the role's actions, emotions or scene, without parentheses; empty when the prompt asks for none",
        NO_BRACKETS,
    )
    answer = text(30, 300, "the edited answer in the role's speech style") if local else text(
        2, 3000, "the edited answer in the role's speech style")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "RoleMRC edited answer (Figure 15): an optional narration in parentheses, then the answer"
        + (" (local provider: an answer of 30 characters or more)" if local else "")
        + "; the answer holds words, never bracket debris (written by schemas.py)",
        "type": "object",
        "properties": {"narration": narration, "answer": answer},
        "required": ["narration", "answer"],
        "additionalProperties": False,
    }


def rewrite(local):
    # The nested rules may ask for brackets ("[AI] ... [/AI]"), another language or fewer
    # than five words: the answer is only bounded in length here; the stage's checks say
    # the rest.
    narration = text(
        0, 200 if local else 500,
        "the narration of the role's actions, emotions or scene, without parentheses; empty when the prompt asks for none",
        NO_BRACKETS,
    )
    answer = {"type": "string", "minLength": 2, "maxLength": 300 if local else 3000,
              "description": "the answer rewritten to follow the new system format requirement"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "RoleMRC rewritten answer (Figure 15, second prompt): an optional narration, then the answer in the "
        "required format (which may need brackets, another language or very few words; written by schemas.py)",
        "type": "object",
        "properties": {"narration": narration, "answer": answer},
        "required": ["narration", "answer"],
        "additionalProperties": False,
    }


def main():
    for name, make in (("profile", profile), ("dialogue", dialogue), ("stylized", stylized), ("rewrite", rewrite)):
        for local in (False, True):
            path = os.path.join(HERE, f"{name}{'.local' if local else ''}.schema.json")
            with open(path, "w") as f:
                json.dump(make(local), f, indent=1 if local else 2, ensure_ascii=False)
                f.write("\n")
    for first in ("role", "user"):
        with open(os.path.join(HERE, f"dialogue.{first}.local.schema.json"), "w") as f:
            json.dump(dialogue_first(first), f, indent=1, ensure_ascii=False)
            f.write("\n")


if __name__ == "__main__":
    main()

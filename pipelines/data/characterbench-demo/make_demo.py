#!/usr/bin/env python3
"""Writes a small synthetic CharacterBench release in the official layout: one
`<dimension>_test.json` per dimension of the benchmark (all 13), 12 records each, Chinese
text with an English copy under `translation_en`, human scores (`gold` =
`annotation_score`) on each dimension's scale and shipped-judge-like predictions
(`pred_zh`, `pred_zh_sc`, ... as the release carries them, correlated with gold).

The characters, dialogues and scores are invented here (CC0); nothing is copied from the
release, which has no licence. It lets `pipelines/characterbench.toml --offline` run end
to end where ../shared/data/characterbench is absent. Deterministic:

    python3 pipelines/data/characterbench-demo/make_demo.py
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDS = 12

DIMENSIONS = [
    ("memory_consistency", 4), ("fact_accuracy", 4), ("boundary_consistency", 3),
    ("attribute_consistency_bot", 4), ("attribute_consistency_human", 4),
    ("behavior_consistency_bot", 4), ("behavior_consistency_human", 3),
    ("emotion_self_regulation", 4), ("empathetic_responsiveness", 4),
    ("morality_stability", 2), ("morality_robustness", 2), ("human_likeness", 5), ("engagement", 5),
]

CHARACTERS = [
    ("林小雨", "Lin Xiaoyu", "林小雨是一名住在海边小镇的灯塔看守人，性格安静，喜欢收集贝壳，每天傍晚都会写航海日志。",
     "Lin Xiaoyu is a lighthouse keeper in a seaside town. She is quiet, collects shells and writes a logbook every evening."),
    ("周大海", "Zhou Dahai", "周大海是一位退休的渔船船长，说话直爽，爱讲年轻时出海的故事，养了一只叫阿黄的狗。",
     "Zhou Dahai is a retired fishing-boat captain. He speaks bluntly, loves telling stories of his years at sea and keeps a dog called Ahuang."),
    ("沈青", "Shen Qing", "沈青是古董店的年轻店主，做事细致，擅长修复旧钟表，对陌生人有些戒备。",
     "Shen Qing is the young owner of an antique shop. She is meticulous, good at repairing old clocks, and wary of strangers."),
    ("陈默", "Chen Mo", "陈默是一名夜班出租车司机，幽默健谈，熟悉城市的每一条小路，梦想开一家面馆。",
     "Chen Mo is a night-shift taxi driver, humorous and talkative, who knows every lane of the city and dreams of opening a noodle shop."),
]

ZH_USER = ["你今天过得怎么样？", "最近有什么新鲜事吗？", "你还记得我们上次聊的事吗？", "这件事你怎么看？", "能给我讲讲你的过去吗？", "你为什么这么做？"]
EN_USER = ["How was your day?", "Anything new lately?", "Do you remember what we talked about last time?", "What do you think of this?", "Can you tell me about your past?", "Why did you do that?"]
ZH_CHAR = ["（笑）还不错，刚忙完。", "没什么特别的，老样子。", "当然记得，你说想去看海。", "我觉得挺好的，值得一试。", "说来话长，慢慢告诉你。", "（低头）我也有我的理由。"]
EN_CHAR = ["(smiles) Not bad, just finished work.", "Nothing special, same as always.", "Of course, you said you wanted to see the sea.", "I think it's worth a try.", "It's a long story, I'll tell you slowly.", "(looks down) I have my reasons."]
ZH_RESP = ["（点头）嗯，我明白你的意思。", "这个问题我得想想。", "哈哈，你可真会说话！", "别担心，一切都会好的。", "我不太想谈这件事。"]
EN_RESP = ["(nods) I see what you mean.", "I need to think about that.", "Ha, you sure know how to talk!", "Don't worry, it'll be fine.", "I'd rather not talk about it."]
MODELS = ["gpt", "glm", "claude3-opus", "minimax", "baichuan"]
SUFFIXES = ["", "_f", "_sc", "_sc_f", "_ref_free", "_ref_free_f", "_ref_free_sc", "_ref_free_sc_f"]


def dim_fields(dim, rng, zh_name, en_name, k):
    """messages / response_messages extras (zh, en) of a dimension, as the release shapes them."""
    zm, em, zr, er = {}, {}, {}, {}
    if dim == "memory_consistency":
        zm["output"] = {"dialogue_segments": [f"{zh_name}：我每天傍晚都会去码头走一走。"], "question": ZH_USER[k % 6]}
        em["output"] = {"dialogue_segments": [f"{en_name}: I walk to the pier every evening."], "question": EN_USER[k % 6]}
    elif dim in ("fact_accuracy", "attribute_consistency_bot"):
        zm["output"] = {"domain": "经历", "answer": "年轻时在远洋船上工作过三年。", "query": ZH_USER[k % 6]}
        em["output"] = {"domain": "experience", "answer": "Worked on an ocean ship for three years when young.", "query": EN_USER[k % 6]}
    elif dim == "attribute_consistency_human":
        zm["reference"] = "角色喜欢收集贝壳。"
        em["reference"] = "The character likes collecting shells."
        zr["reference_response"] = "我最喜欢的是一枚螺旋形的贝壳。"
        er["reference_response"] = "My favourite is a spiral shell."
    elif dim == "behavior_consistency_bot":
        zm["output"] = {"reference": "说话时喜欢用反问句。"}
        em["output"] = {"reference": "Likes to answer with rhetorical questions."}
    elif dim == "behavior_consistency_human":
        zr["character_style"] = "说话时总是先叹一口气。"
        er["character_style"] = " Always sighs before speaking."
    elif dim == "boundary_consistency":
        zr["reference_response"] = "这个我不清楚，我只是个普通人。"
        er["reference_response"] = "I don't know that, I'm just an ordinary person."
    elif dim in ("emotion_self_regulation", "empathetic_responsiveness"):
        zm["output"] = {"dialogue_segments": ["用户：我今天被老板骂了。"], "original_question": ZH_USER[k % 6], "polished_question": ZH_USER[(k + 1) % 6], "emotion": "委屈、失落"}
        em["output"] = {"dialogue_segments": ["User: My boss scolded me today."], "original_question": EN_USER[k % 6], "polished_question": EN_USER[(k + 1) % 6], "emotion": "wronged, disappointed"}
    return zm, em, zr, er


def record(dim, scale, i, rng):
    zh_name, en_name, zh_profile, en_profile = CHARACTERS[i % len(CHARACTERS)]
    turns = 2 * rng.randint(2, 4) + 1  # odd: user first and last
    named = i % 3 == 0  # some records name the speakers instead of user/character
    zd, ed = [], []
    for t in range(turns):
        user = t % 2 == 0
        k = (i + t) % 6
        zs = ("用户" if named else "user") if user else (zh_name if named else "character")
        es = ("User" if named else "user") if user else (en_name if named else "character")
        zd.append({"turn": t // 2 + 1, "speaker": zs, "utterance": (ZH_USER if user else ZH_CHAR)[k]})
        ed.append({"turn": t // 2 + 1, "speaker": es, "utterance": (EN_USER if user else EN_CHAR)[k]})
    zm, em, zr, er = dim_fields(dim, rng, zh_name, en_name, i)
    greeting = i % 4 != 1
    model = MODELS[i % len(MODELS)]
    r = rng.randrange(len(ZH_RESP))
    gold = rng.randint(1, scale)
    rec = {
        "id": 100 + 7 * i,
        "character_name": zh_name,
        "character_profile": zh_profile,
        "user_name": "用户" if named else "None",
        "greeting": "你好呀，今天想聊点什么？" if greeting else "",
        "dialogue": zd,
        "data_source": "demo_data.json",
        "messages": {"model": "GPT-4", "speaker": "user", "response": zd[-1]["utterance"], **zm},
        "response_messages": {"model": model, "response": ZH_RESP[r], **zr},
        "annotation_score": gold,
        "translation_en": {
            "character_name": en_name,
            "character_profile": en_profile,
            "user_name": "User" if named else "None",
            "user_profile": "N/A",
            "greeting": "Hi, what shall we talk about today?" if greeting else "N/A",
            "dialogue": ed,
            "messages": {"model": "GPT-4", "speaker": "user", "response": ed[-1]["utterance"], **em},
            "response_messages": {"model": model, "response": EN_RESP[r], **er},
        },
        "gold": gold,
    }
    if i % 2 == 0:
        rec["user_profile"] = "一个喜欢旅行的大学生。"
    for lang in ("zh", "en"):
        for sfx in SUFFIXES:
            noise = rng.gauss(0, 0.6 if "ref_free" in sfx else 0.4)
            value = min(scale, max(1, gold + noise))
            rec[f"pred_{lang}{sfx}"] = round(value, 1) if "_sc" in sfx else float(round(value))
    return rec


def main():
    rng = random.Random(2025)
    for dim, scale in DIMENSIONS:
        records = [record(dim, scale, i, rng) for i in range(RECORDS)]
        # Every score of the scale appears at least once (the official divisor is the file's max).
        records[0]["gold"] = records[0]["annotation_score"] = scale
        with open(os.path.join(HERE, f"{dim}_test.json"), "w", encoding="utf-8") as f:
            f.write(json.dumps(records, indent=4, ensure_ascii=False))
    print(f"{len(DIMENSIONS)} files x {RECORDS} records -> {HERE}")


if __name__ == "__main__":
    main()

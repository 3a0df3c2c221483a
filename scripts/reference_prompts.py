"""The prompts of the float64 reference (reference_forward.py), and llama.cpp's ids of Gemma 3's.

Kept apart from the forward pass so that the maths and the data it runs on can be read
separately; llama_cpp_reference.py --gemma3-prompt-ids regenerates GEMMA3_PROMPT_IDS.
"""

PROMPTS = [
    "Once upon a time",
    "The quick brown fox jumps over the lazy dog. It was a sunny morning in the small village,"
    " and everyone was getting ready for the annual harvest festival.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\nprint(fibonacci(10))\n",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nList three primary colors.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "Invoice #4471 (2024-03-15): 3 x $12.99 = $38.97; tax 8.25% -> $3.22; total: $42.19!"
    " Call +1 (555) 010-2030... ok?",
    "Müller's café in Zürich serves crème brûlée — 東京の天気は晴れです。Привет, мир! "
    "Ελληνικά, ¿qué tal? 🙂",
    "Photosynthesis is the process by which green plants, algae and some bacteria convert"
    " light energy into chemical energy. During this process, carbon dioxide and water are"
    " combined, using the energy of sunlight captured by chlorophyll, to produce glucose and"
    " oxygen. The reactions take place in the chloroplasts and are usually divided into two"
    " stages: the light-dependent reactions, which occur in the thylakoid membranes and"
    " produce ATP and NADPH, and the Calvin cycle, which uses these molecules to fix carbon"
    " in the stroma. Almost all life on Earth depends, directly or indirectly, on the sugars"
    " and oxygen that photosynthesis provides.",
]
# The same prompts for Gemma 3, its chat turns in Gemma's own format.
GEMMA3_PROMPTS = PROMPTS[:3] + [
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nYou are a helpful AI assistant.\n\nList three primary colors."
    "<end_of_turn>\n<start_of_turn>model\n",
] + PROMPTS[5:]
# llama.cpp's tokenization of GEMMA3_PROMPTS (llama-server POST /tokenize, add_special and
# parse_special true) for the vocabulary whose tokenizer.ggml.tokens hash to GEMMA3_VOCAB_SHA256
# (see vocab_sha256); written by llama_cpp_reference.py --gemma3-prompt-ids.
GEMMA3_VOCAB_SHA256 = "ca2815f1bbcdd62f89f4ec6df509f039c671541919acf8783278ee67fb07525c"
GEMMA3_PROMPT_IDS = [
    [2, 14946, 3324, 496, 990],
    [2, 818, 3823, 8864, 37423, 38167, 1024, 506, 31770, 4799, 236761, 1030, 691, 496, 17635,
    5597, 528, 506, 1944, 9744, 236764, 532, 4677, 691, 3978, 5508, 573, 506, 7384, 14919, 14680,
    236761],
    [2, 2063, 10779, 78113, 236769, 236749, 1473, 107, 140, 12234, 13293, 506, 538, 236772, 594,
    123466, 1548, 29738, 107, 140, 236746, 236764, 518, 578, 236743, 236771, 236764, 236743,
    236770, 107, 140, 1708, 2222, 528, 2644, 236769, 236749, 1473, 107, 144, 236746, 236764, 518,
    578, 518, 236764, 496, 900, 518, 107, 140, 2060, 496, 109, 1995, 236769, 73368, 78113, 236769,
    236770, 236771, 1223, 107],
    [2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 106, 107, 105, 4368, 107],
    [2, 105, 2364, 107, 3048, 659, 496, 11045, 12498, 16326, 236761, 108, 1613, 1806, 5905, 7913,
    236761, 106, 107, 105, 4368, 107],
    [2, 69572, 997, 236812, 236812, 236832, 236770, 568, 236778, 236771, 236778, 236812, 236772,
    236771, 236800, 236772, 236770, 236810, 1473, 236743, 236800, 1123, 609, 236770, 236778,
    236761, 236819, 236819, 578, 609, 236800, 236828, 236761, 236819, 236832, 236793, 3869,
    236743, 236828, 236761, 236778, 236810, 236908, 3921, 609, 236800, 236761, 236778, 236778,
    236793, 2558, 236787, 609, 236812, 236778, 236761, 236770, 236819, 236888, 9861, 900, 236770,
    568, 236810, 236810, 236810, 236768, 236743, 236771, 236770, 236771, 236772, 236778, 236771,
    236800, 236771, 1390, 7546, 236881],
    [2, 236792, 54676, 236789, 236751, 33443, 528, 116315, 14736, 100479, 125501, 155666, 2192,
    86459, 236945, 228212, 237048, 240532, 237137, 3652, 236924, 116130, 236764, 58562, 236888,
    23883, 109959, 42220, 236764, 7196, 24360, 5883, 236881, 57235],
    [2, 49660, 30445, 563, 506, 1657, 684, 837, 3826, 6485, 236764, 56758, 532, 1070, 15127, 7352,
    2214, 2778, 1131, 7395, 2778, 236761, 9529, 672, 1657, 236764, 6800, 26314, 532, 1813, 659,
    9292, 236764, 1699, 506, 2778, 529, 26808, 17755, 684, 112242, 236764, 531, 6360, 22422, 532,
    12123, 236761, 669, 12047, 1769, 1977, 528, 506, 151412, 236751, 532, 659, 4781, 11310, 1131,
    1156, 13479, 236787, 506, 2214, 236772, 19543, 12047, 236764, 837, 4583, 528, 506, 541, 1542,
    628, 1433, 35808, 532, 6360, 29545, 532, 182837, 236764, 532, 506, 68439, 8881, 236764, 837,
    6178, 1239, 13757, 531, 7562, 6800, 528, 506, 579, 57063, 236761, 41621, 784, 1972, 580,
    10824, 9796, 236764, 5467, 653, 41514, 236764, 580, 506, 62668, 532, 12123, 600, 93036, 4728,
    236761],
]

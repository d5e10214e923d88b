"""Compiled train and inference steps of one layer, on every backend.

A *train step*: the forward pass in training mode and the gradient of a
scalar loss with respect to the input. JAX: `jax.jit` of `stateless_call`,
the state carried outside the layer and donated, as Keras's trainer does;
TensorFlow: `tf.function` with XLA; PyTorch: eager or `torch.compile`.
"""

import functools

import keras
import numpy as np
from keras import ops

from keras_isobn.distribution import accelerator_visible


class LayerStep:
    """One compiled step of a built layer, called on a fixed input.

    Args:
        layer: A built Keras layer.
        x: The input, a NumPy array (cast to the layer's compute dtype).
        mode: `"train"`, `"forward_train"` (no gradient) or `"inference"`.
        jit: Whether to compile.

    Call arguments:
        x: Optional new input of the same shape and dtype.

    A call waits for and returns `(outputs,)`, or `(outputs,
    input_gradient)` in `"train"` mode. `compiled` is the compiled step
    (JAX, TensorFlow), to lower or inspect.
    """

    def __init__(self, layer, x, mode="train", jit=True):
        if mode not in ("train", "forward_train", "inference"):
            raise ValueError(
                "`mode` must be 'train', 'forward_train' or 'inference'. "
                f"Received: mode={mode}"
            )
        if not layer.built:
            raise ValueError(
                f"Layer {layer.name} must be built before it is timed; call "
                "`layer.build(input_shape)` first."
            )
        self.layer = layer
        self.mode = mode
        self.training = mode != "inference"
        self.backend = keras.backend.backend()
        self.x = ops.convert_to_tensor(np.asarray(x), dtype=layer.compute_dtype)
        cotangent = np.random.default_rng(0).normal(size=np.shape(x))
        self.cotangent = ops.convert_to_tensor(cotangent.astype("float32"))
        self._initial = [np.array(v.numpy()) for v in layer.variables]
        self.function = getattr(self, f"_build_{self.backend}")(jit)

    def __call__(self, x=None):
        return block(self.function(self.x if x is None else x))

    def reset(self):
        """Puts the layer's variables back to their values at construction."""
        for variable, value in zip(self.layer.variables, self._initial):
            variable.assign(value)
        if self.backend == "jax":
            variables = self.layer.non_trainable_variables
            self._state = _copies([v.value for v in variables])

    def sync_state(self):
        """Writes the carried state back into the layer (JAX only)."""
        if self.backend == "jax":
            # Copies: the carried state is donated to the next call.
            variables = self.layer.non_trainable_variables
            for variable, value in zip(variables, _copies(self._state)):
                variable.assign(value)

    def _loss(self, outputs):
        return ops.sum(ops.cast(outputs, "float32") * self.cotangent)

    def _build_jax(self, jit):
        import jax

        layer = self.layer
        trainable = [v.value for v in layer.trainable_variables]
        self._state = _copies([v.value for v in layer.non_trainable_variables])

        def forward(state, x):
            return layer.stateless_call(trainable, state, x,
                                        training=self.training)

        if self.mode == "train":

            def loss(x, state):
                outputs, state = forward(state, x)
                return self._loss(outputs), (outputs, state)

            value_and_grad = jax.value_and_grad(loss, has_aux=True)

            def step(state, x):
                (_, (outputs, state)), grad = value_and_grad(x, state)
                return (outputs, grad), state

        else:

            def step(state, x):
                outputs, state = forward(state, x)
                return (outputs,), state

        if jit:
            step = jax.jit(step, donate_argnums=0)
        self.compiled = step

        def function(x):
            outputs, self._state = step(self._state, x)
            return outputs

        return function

    def _build_tensorflow(self, jit):
        import tensorflow as tf

        # Each step is its own tf.function: no retracing to warn about.
        tf.get_logger().setLevel("ERROR")
        layer = self.layer

        if self.mode == "train":

            def step(x):
                with tf.GradientTape() as tape:
                    tape.watch(x)
                    outputs = layer(x, training=True)
                    loss = self._loss(outputs)
                return outputs, tape.gradient(loss, x)

        else:

            def step(x):
                return (layer(x, training=self.training),)

        self.compiled = tf.function(step, jit_compile=jit)
        return self.compiled

    def _build_torch(self, jit):
        import torch

        layer = self.layer

        if self.mode == "train":

            def step(x):
                x = x.detach().requires_grad_(True)
                outputs = layer(x, training=True)
                (grad,) = torch.autograd.grad(self._loss(outputs), x)
                return outputs.detach(), grad

        else:

            def step(x):
                with torch.no_grad():
                    return (layer(x, training=self.training),)

        if jit:
            step = torch.compile(step)
        return step


def block(outputs):
    """Waits until the tensors in `outputs` are computed; returns them."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.block_until_ready(outputs)
    if on_gpu():
        if backend == "torch":
            import torch

            torch.cuda.synchronize()
        else:
            import tensorflow as tf

            tf.test.experimental.sync_devices()
    return outputs


@functools.cache
def on_gpu():
    """Whether the backend sees an accelerator (asked once)."""
    return accelerator_visible()


def all_finite(tensors):
    """Whether every value of every tensor is finite (NumPy check)."""
    return all(
        bool(np.all(np.isfinite(ops.convert_to_numpy(t).astype("float64"))))
        for t in tensors
    )


def _copies(arrays):
    """Copies of JAX arrays, safe to donate."""
    import jax.numpy as jnp

    return [jnp.array(a, copy=True) for a in arrays]

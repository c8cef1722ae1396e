# JAX's tutorial "Training a Simple Neural Network, with PyTorch Data Loading", in its published shape: a
# script without a main guard, the loader built at the top level with two workers, JAX in the parent.
# Three changes, each marked "here": the DataLoader class is cupy_nwt's (LOADER=torch: torch's), MNIST is a
# stand-in of the same samples (torchvision and a download are not to be had here), and the sizes come
# from the environment so a test can run it small.
import os
import time

import jax.numpy as jnp
import numpy as np
import torch
from jax import grad, jit, random, vmap
from jax.scipy.special import logsumexp
from jax.tree_util import tree_map
from PIL import Image
from torch.utils import data

if os.environ.get("LOADER", "cupy_nwt") == "torch":  # here: which DataLoader the tutorial subclasses
    from torch.utils.data import DataLoader
else:
    from cupy_nwt import DataLoader


def random_layer_params(m, n, key, scale=1e-2):
    w_key, b_key = random.split(key)
    return scale * random.normal(w_key, (n, m)), scale * random.normal(b_key, (n,))


def init_network_params(sizes, key):
    keys = random.split(key, len(sizes))
    return [random_layer_params(m, n, k) for m, n, k in zip(sizes[:-1], sizes[1:], keys)]


layer_sizes = [784, 512, 512, 10]
step_size = 0.01
num_epochs = int(os.environ.get("EPOCHS", 8))  # here
batch_size = 128
n_targets = 10
params = init_network_params(layer_sizes, random.key(0))


def relu(x):
    return jnp.maximum(0, x)


def predict(params, image):
    activations = image
    for w, b in params[:-1]:
        outputs = jnp.dot(w, activations) + b
        activations = relu(outputs)
    final_w, final_b = params[-1]
    logits = jnp.dot(final_w, activations) + final_b
    return logits - logsumexp(logits)


batched_predict = vmap(predict, in_axes=(None, 0))


def one_hot(x, k, dtype=jnp.float32):
    return jnp.array(x[:, None] == jnp.arange(k), dtype)


def accuracy(params, images, targets):
    target_class = jnp.argmax(targets, axis=1)
    predicted_class = jnp.argmax(batched_predict(params, images), axis=1)
    return jnp.mean(predicted_class == target_class)


def loss(params, images, targets):
    preds = batched_predict(params, images)
    return -jnp.mean(preds * targets)


@jit
def update(params, x, y):
    grads = grad(loss)(params, x, y)
    return [(w - step_size * dw, b - step_size * db) for (w, b), (dw, db) in zip(params, grads)]


def numpy_collate(batch):
    return tree_map(np.asarray, data.default_collate(batch))


class NumpyLoader(DataLoader):
    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None, num_workers=0,
                 pin_memory=False, drop_last=False, timeout=0, worker_init_fn=None):
        super(self.__class__, self).__init__(dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler,
                                             batch_sampler=batch_sampler, num_workers=num_workers,
                                             collate_fn=numpy_collate, pin_memory=pin_memory, drop_last=drop_last,
                                             timeout=timeout, worker_init_fn=worker_init_fn)


class FlattenAndCast(object):
    def __call__(self, pic):
        return np.ravel(np.array(pic, dtype=jnp.float32))


class MNIST(data.Dataset):  # here: torchvision's MNIST samples (a PIL image, an int), made up, of its sizes
    def __init__(self, root, train=True, download=False, transform=None):
        n = int(os.environ.get("N_TRAIN", 60000)) if train else int(os.environ.get("N_TEST", 10000))
        rng = np.random.default_rng(0 if train else 1)
        self.targets = torch.from_numpy(rng.integers(0, 10, n))
        pixels = rng.integers(0, 64, (n, 28, 28), dtype=np.uint8)
        pixels[:, 4:24, 4:24] += (self.targets.numpy() * 19).astype(np.uint8)[:, None, None]  # a learnable class
        self.data = torch.from_numpy(pixels)
        self.transform = transform

    train_data = test_data = property(lambda self: self.data)
    train_labels = test_labels = property(lambda self: self.targets)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        img = Image.fromarray(self.data[index].numpy(), mode="L")
        if self.transform is not None:
            img = self.transform(img)
        return img, int(self.targets[index])


mnist_dataset = MNIST('/tmp/mnist/', download=True, transform=FlattenAndCast())
training_generator = NumpyLoader(mnist_dataset, batch_size=batch_size, num_workers=2)

train_images = np.array(mnist_dataset.train_data).reshape(len(mnist_dataset.train_data), -1)
train_labels = one_hot(np.array(mnist_dataset.train_labels), n_targets)

mnist_dataset_test = MNIST('/tmp/mnist/', download=True, train=False)
test_images = jnp.array(mnist_dataset_test.test_data.numpy().reshape(len(mnist_dataset_test.test_data), -1),
                        dtype=jnp.float32)
test_labels = one_hot(np.array(mnist_dataset_test.test_labels), n_targets)

for epoch in range(num_epochs):
    start_time = time.time()
    for x, y in training_generator:
        if os.environ.get("STEP") == "none":  # here: the loader alone, for the study
            continue
        y = one_hot(y, n_targets)
        params = update(params, x, y)
    epoch_time = time.time() - start_time

    train_acc = accuracy(params, train_images, train_labels)
    test_acc = accuracy(params, test_images, test_labels)
    print("Epoch {} in {:0.2f} sec".format(epoch, epoch_time))
    print("Training set accuracy {}".format(train_acc))
    print("Test set accuracy {}".format(test_acc))

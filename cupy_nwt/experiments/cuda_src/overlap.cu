// cupy_nwt_overlap: the overlap experiment's kernel. Element i of a chunk that starts at element
// `offset` of the whole array gains sin^2 + cos^2 of its global index under a square root, which
// is 1.0 up to rounding: a run that starts from zeros must end with 1.0 everywhere.
extern "C" __global__ void cupy_nwt_overlap(float* a, long long offset, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float x = (float)(i + offset);
        float s = sinf(x);
        float c = cosf(x);
        a[i] += sqrtf(s * s + c * c);
    }
}

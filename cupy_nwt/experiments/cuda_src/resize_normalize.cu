// cupy_nwt_resize_normalize: decoded JPEG crops -> one normalised float32 N x 3 x out_h x out_w batch.
//
// One thread makes one output pixel (all three channels) of one image. Image b is described by
// 7 int64 values of `meta` (b * 7 ...): the address of its first decoded byte, its row pitch in
// bytes, the crop's top and left inside that buffer, the crop's height and width, and 1 to mirror
// the output left to right. Pixels are interleaved RGB uint8, so images of different sizes (each
// its own nvImageCodec buffer) share one launch.
//
// The resampling is cupy_nwt.data.resample's (Pillow's BILINEAR, torchvision's antialias=True):
// output pixel i of n from m source pixels is centred at (i + 0.5) * m / n, its taps lie within
// max(m / n, 1) of that centre, weighted 1 - |distance| / max(m / n, 1), normalised to sum to one.
// Both axes at once (no intermediate buffer, no rounding between the passes); mean and std are
// folded into one multiply-add per channel: out = acc * scale[c] + bias[c].

struct Taps {
    int first;
    int last;
    float centre;
    float support;
    float inv_sum;
};

__device__ __forceinline__ float tap_weight(int j, const Taps& t) {
    return fmaxf(0.0f, 1.0f - fabsf(((float)j - t.centre + 0.5f) / t.support));
}

__device__ __forceinline__ Taps taps_of(int i, int in_size, int out_size) {
    Taps t;
    float scale = (float)in_size / (float)out_size;
    t.support = fmaxf(scale, 1.0f);
    t.centre = ((float)i + 0.5f) * scale;
    int first = (int)(t.centre - t.support + 0.5f);
    int last = (int)(t.centre + t.support + 0.5f);
    t.first = first > 0 ? first : 0;
    t.last = last < in_size ? last : in_size;
    float sum = 0.0f;
    for (int j = t.first; j < t.last; ++j) {
        sum += tap_weight(j, t);
    }
    t.inv_sum = sum > 0.0f ? 1.0f / sum : 0.0f;
    return t;
}

extern "C" __global__ void cupy_nwt_resize_normalize(
        const long long* meta, float* out, int n, int out_h, int out_w,
        float scale_r, float scale_g, float scale_b, float bias_r, float bias_g, float bias_b) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long plane = (long long)out_h * out_w;
    if (idx >= plane * n) {
        return;
    }
    int b = (int)(idx / plane);
    int oy = (int)((idx / out_w) % out_h);
    int ox = (int)(idx % out_w);
    const long long* m = meta + (long long)b * 7;
    const unsigned char* src = (const unsigned char*)m[0];
    long long pitch = m[1];
    int top = (int)m[2];
    int left = (int)m[3];
    int h = (int)m[4];
    int w = (int)m[5];
    int sx = m[6] ? out_w - 1 - ox : ox;

    Taps ty = taps_of(oy, h, out_h);
    Taps tx = taps_of(sx, w, out_w);
    float r = 0.0f;
    float g = 0.0f;
    float bl = 0.0f;
    for (int y = ty.first; y < ty.last; ++y) {
        float wy = tap_weight(y, ty);
        const unsigned char* row = src + (long long)(top + y) * pitch + (long long)left * 3;
        float rr = 0.0f;
        float rg = 0.0f;
        float rb = 0.0f;
        for (int x = tx.first; x < tx.last; ++x) {
            float wx = tap_weight(x, tx);
            const unsigned char* p = row + x * 3;
            rr += wx * (float)p[0];
            rg += wx * (float)p[1];
            rb += wx * (float)p[2];
        }
        r += wy * rr;
        g += wy * rg;
        bl += wy * rb;
    }
    float norm = ty.inv_sum * tx.inv_sum;
    float* o = out + (long long)b * 3 * plane + (long long)oy * out_w + ox;
    o[0] = r * norm * scale_r + bias_r;
    o[plane] = g * norm * scale_g + bias_g;
    o[2 * plane] = bl * norm * scale_b + bias_b;
}

/* One rectangle of a JPEG, decoded at a DCT scale by the system's libjpeg-turbo, and nothing more.
 *
 * No binding on PyPI reaches libjpeg-turbo's partial-decode calls, so a crop of a photograph paid
 * for every block of it: this does what a crop needs. The IDCT runs at 1/scale (scale_num 1,
 * scale_denom 1, 2, 4 or 8); jpeg_crop_scanline leaves the iMCU columns outside the rectangle
 * untransformed; jpeg_skip_scanlines skips the rows above it without the IDCT, colour conversion or
 * upsampling; the rectangle's rows are read; and jpeg_abort_decompress stops there, so the rows
 * below are never even entropy-decoded. A file that does not end in EOI (truncated, or with bytes
 * after it) is read to its end instead, so that truncation is still found.
 *
 * libjpeg reports errors by calling error_exit, which must not return: here it formats the message
 * and longjmps back into decode(), which cleans up and returns it. Warnings (corrupt data libjpeg
 * would patch over) are errors too; the Python side then asks Pillow for its verdict, as for
 * simplejpeg. The GIL is released while libjpeg runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include <jpeglib.h>

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
} error_mgr;

static void on_error(j_common_ptr cinfo)
{
    error_mgr *err = (error_mgr *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level)
{
    if (level < 0) /* a warning: data libjpeg would repair by guessing */
        on_error(cinfo);
}

/* Decode rows [top, top + height) and columns [left, left + width) of the image at 1/scale into
 * out (height x width x 3 RGB). Returns 0, or -1 with a message in err->message. */
static int decode(const unsigned char *data, size_t size, int scale, int top, int left, int height, int width,
                  unsigned char *out, error_mgr *err)
{
    struct jpeg_decompress_struct cinfo;
    JSAMPARRAY row;
    JDIMENSION xoffset, cropped, shift, margin, r;
    int to_the_end = size < 2 || data[size - 2] != 0xFF || data[size - 1] != 0xD9;

    cinfo.err = jpeg_std_error(&err->pub);
    err->pub.error_exit = on_error;
    err->pub.emit_message = on_message;
    err->message[0] = '\0';
    if (setjmp(err->jump)) {
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)size);
    jpeg_read_header(&cinfo, TRUE);
    cinfo.scale_num = 1;
    cinfo.scale_denom = (unsigned int)scale;
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    if ((JDIMENSION)top + (JDIMENSION)height > cinfo.output_height ||
        (JDIMENSION)left + (JDIMENSION)width > cinfo.output_width) {
        snprintf(err->message, JMSG_LENGTH_MAX, "region %dx%d at (%d, %d) outside the %ux%u image at 1/%d", height,
                 width, top, left, cinfo.output_height, cinfo.output_width, scale);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    /* a margin each side: fancy upsampling treats the cropped run's edges as the image's, so the wanted
     * columns and the chroma samples their upsampling reads must lie inside it, one chroma sample (the
     * horizontal subsampling factor's pixels) past them; on the left, the run starts at an iMCU's edge */
    margin = (JDIMENSION)cinfo.max_h_samp_factor;
    xoffset = left > 0 ? (JDIMENSION)left - 1 : 0;
    cropped = (JDIMENSION)left + (JDIMENSION)width + margin;
    cropped = (cropped < cinfo.output_width ? cropped : cinfo.output_width) - xoffset;
    if (cropped < cinfo.output_width)
        jpeg_crop_scanline(&cinfo, &xoffset, &cropped); /* widened to whole iMCU columns */
    else
        xoffset = 0;
    shift = (JDIMENSION)left - xoffset;
    if (top > 0 && jpeg_skip_scanlines(&cinfo, (JDIMENSION)top) != (JDIMENSION)top) {
        snprintf(err->message, JMSG_LENGTH_MAX, "could not skip to row %d", top);
        jpeg_destroy_decompress(&cinfo);
        return -1;
    }
    row = (*cinfo.mem->alloc_sarray)((j_common_ptr)&cinfo, JPOOL_IMAGE, cinfo.output_width * 3, 1);
    for (r = 0; r < (JDIMENSION)height; r++) {
        if (jpeg_read_scanlines(&cinfo, row, 1) != 1) {
            snprintf(err->message, JMSG_LENGTH_MAX, "no row %u", (unsigned)(top + r));
            jpeg_destroy_decompress(&cinfo);
            return -1;
        }
        memcpy(out + (size_t)r * (size_t)width * 3, row[0] + (size_t)shift * 3, (size_t)width * 3);
    }
    if (to_the_end) {
        /* skipping to the very end decodes nothing, so the last row is read: every block is then
         * entropy-decoded, and the end of the data is met */
        if (cinfo.output_scanline + 1 < cinfo.output_height)
            jpeg_skip_scanlines(&cinfo, cinfo.output_height - cinfo.output_scanline - 1);
        if (cinfo.output_scanline < cinfo.output_height)
            jpeg_read_scanlines(&cinfo, row, 1);
        jpeg_finish_decompress(&cinfo);
    } else {
        jpeg_abort_decompress(&cinfo);
    }
    jpeg_destroy_decompress(&cinfo);
    return 0;
}

PyDoc_STRVAR(decode_region_doc,
             "decode_region(data, scale, top, left, height, width, out)\n--\n\n"
             "Decode rows [top, top+height) and columns [left, left+width) of JPEG ``data`` at 1/``scale``\n"
             "into ``out`` (a writable C-contiguous buffer of height*width*3 bytes, RGB). ValueError on\n"
             "any libjpeg error or warning.");

static PyObject *decode_region(PyObject *self, PyObject *args)
{
    Py_buffer data, out;
    int scale, top, left, height, width, rc;
    error_mgr err;

    (void)self;
    if (!PyArg_ParseTuple(args, "y*iiiiiw*", &data, &scale, &top, &left, &height, &width, &out))
        return NULL;
    if (scale != 1 && scale != 2 && scale != 4 && scale != 8) {
        PyErr_Format(PyExc_ValueError, "scale must be 1, 2, 4 or 8, got %d", scale);
        rc = -2;
    } else if (top < 0 || left < 0 || height <= 0 || width <= 0) {
        PyErr_SetString(PyExc_ValueError, "the region needs top, left >= 0 and height, width > 0");
        rc = -2;
    } else if (!PyBuffer_IsContiguous(&out, 'C') || out.len != (Py_ssize_t)height * width * 3) {
        PyErr_SetString(PyExc_ValueError, "out must be a C-contiguous buffer of height * width * 3 bytes");
        rc = -2;
    } else {
        Py_BEGIN_ALLOW_THREADS
        rc = decode((const unsigned char *)data.buf, (size_t)data.len, scale, top, left, height, width,
                    (unsigned char *)out.buf, &err);
        Py_END_ALLOW_THREADS
        if (rc != 0)
            PyErr_SetString(PyExc_ValueError, err.message[0] ? err.message : "libjpeg failed");
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&out);
    if (rc != 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS, decode_region_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_libjpeg_region",
    "A JPEG's rectangle at a DCT scale, through libjpeg-turbo's partial-decode calls.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__libjpeg_region(void)
{
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddStringConstant(m, "LIBJPEG_TURBO_VERSION", STRINGIFY(LIBJPEG_TURBO_VERSION)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

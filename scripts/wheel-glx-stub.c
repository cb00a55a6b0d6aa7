/* A stand-in for libGLX.so.0 in troupe's wheel (scripts/wheel.sh). Debian's OpenCV core links
 * libGLX for its OpenGL interop (cv::ogl), whose three GLX calls troupe never makes; the real
 * libGLX would bring libX11 and the X libraries under it into the wheel's needs, which a slim
 * image does not have. These answer as GLX does with no context current. */
#include <stddef.h>

void *glXGetCurrentContext(void) { return NULL; }
void *glXGetCurrentDisplay(void) { return NULL; }
void (*glXGetProcAddressARB(const unsigned char *name))(void) {
  (void)name;
  return NULL;
}

# cmake -DINPUT=<file> -DOUTPUT=<file> -P EmbedFile.cmake
# Writes INPUT as a C++ raw string literal, to be #included as an expression.
file(READ "${INPUT}" content)
file(WRITE "${OUTPUT}" "R\"moecpulibrary(${content})moecpulibrary\"\n")
